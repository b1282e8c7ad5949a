"""``python -m flagos_torchfl run``: the launched program itself — argv, __main__, sys.path[0],
exit codes, tracebacks, usage errors and the precedence of ``--backend``."""
import sys

from tests.cli.launching import REPORT_FUNCTION, launch, state, write

# The first line looks at the package without importing it: it must already be active.
PROBE = REPORT_FUNCTION + '''
import os, sys
fl_state("main", name=__name__, argv=sys.argv, path0=sys.path[0], file=__file__,
         env={k: v for k, v in os.environ.items() if k.startswith("FL_")})
raise SystemExit(int(os.environ.get("EXIT_WITH", "0")))
'''


def test_script_runs_as_main_with_argv_and_its_exit_code(tmp_path):
    script = write(tmp_path / "scripts", "probe.py", PROBE)
    proc = launch("--backend", "cpu", "scripts/probe.py", "a", "--flag", "-m", "x",
                  cwd=tmp_path, env={"EXIT_WITH": "3"})
    assert proc.returncode == 3, proc.stderr
    assert "routing report" not in proc.stderr  # only with --report
    seen = state(proc.stdout, "main")
    assert seen["backend"] == "cpu" and seen["source"] == "launcher"
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(script), "a", "--flag", "-m", "x"]
    assert seen["file"] == str(script)
    assert seen["path0"] == str(script.parent)


def test_module_runs_as_main_with_argv_and_cwd_first_on_path(tmp_path):
    module = write(tmp_path, "pkg/probe.py", PROBE)
    write(tmp_path, "pkg/__init__.py", "")
    proc = launch("-m", "pkg.probe", "--backend", "x", cwd=tmp_path, env={"EXIT_WITH": "4"})
    assert proc.returncode == 4, proc.stderr
    seen = state(proc.stdout, "main")
    assert seen["backend"] == "cpu" and seen["source"] == "auto"
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(module), "--backend", "x"]
    assert seen["path0"] == str(tmp_path)


def test_uncaught_exception_exits_1_with_the_programs_traceback(tmp_path):
    write(tmp_path, "boom.py", '''
        def explode():
            raise ValueError("boom in the program")
        explode()
    ''')
    proc = launch("boom.py", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Traceback (most recent call last):"), proc.stderr
    assert 'boom.py", line 4, in <module>' in proc.stderr and "in explode" in proc.stderr
    assert proc.stderr.rstrip().endswith("ValueError: boom in the program")
    assert "runpy" not in proc.stderr and "cli/run.py" not in proc.stderr


def test_usage_errors_exit_2_naming_the_problem_and_choices_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    write(tmp_path, "touch.py", f"open({str(marker)!r}, 'w').close()\n")
    cases = [  # the rest of the usage errors: test_launcher_parts, in-process
        (["--backend", "asend", "touch.py"], "unknown --backend value 'asend'. Did you mean 'ascend'? Valid names:"),
        (["--log-level", "inf", "touch.py"], "invalid --log-level 'inf'. Did you mean 'INFO'? Valid levels:"),
        (["missing.py"], "cannot open script 'missing.py'"),
    ]
    for args, message in cases:
        proc = launch(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
    assert not marker.exists()


def test_backend_option_wins_over_fl_backend_in_the_environment(tmp_path):
    write(tmp_path, "probe.py", PROBE)
    proc = launch("--backend", "host", "probe.py", cwd=tmp_path, env={"FL_BACKEND": "ascend"})
    assert proc.returncode == 0, proc.stderr
    seen = state(proc.stdout, "main")
    assert (seen["backend"], seen["source"]) == ("cpu", "launcher")
    assert seen["env"]["FL_BACKEND"] == "cpu" and seen["env"]["FL_BACKEND_FROM_LAUNCHER"] == "1"


def test_activation_failure_in_the_program_exits_1_with_the_reason(tmp_path):
    write(tmp_path, "probe.py", PROBE)
    proc = launch("--backend", "ascend", "probe.py", cwd=tmp_path)
    assert proc.returncode == 1
    assert "flagos_torchfl: cannot activate backend ascend:" in proc.stderr
    assert "torch_npu" in proc.stderr and '"tag"' not in proc.stdout


def test_report_and_log_level_reach_the_program(tmp_path):
    write(tmp_path, "probe.py", PROBE)
    proc = launch("--report", "--log-level", "debug", "probe.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    env = state(proc.stdout, "main")["env"]
    assert env["FL_RUN_REPORT"] == "1" and env["FL_LOG_LEVEL"] == "DEBUG"
    assert "[flagos_torchfl] INFO backend cpu active" in proc.stderr
    assert any(line.startswith("routing report") for line in proc.stderr.splitlines()), proc.stderr


def test_command_runs_activated_and_its_exit_code_is_passed_through(tmp_path):
    code = REPORT_FUNCTION + "import sys, torch\nfl_state('command')\nsys.exit(7)\n"
    proc = launch("--backend", "cpu", "--", sys.executable, "-c", code, cwd=tmp_path)
    assert proc.returncode == 7, proc.stderr
    seen = state(proc.stdout, "command")
    assert (seen["backend"], seen["source"]) == ("cpu", "launcher")


def test_nested_launcher_uses_its_own_choice(tmp_path):
    write(tmp_path, "inner.py", REPORT_FUNCTION + "fl_state('inner')\n")
    write(tmp_path, "outer.py", f'''
        import subprocess, sys
        code = subprocess.call([sys.executable, "-m", "flagos_torchfl", "run", "--backend", "cpu",
                                {str(tmp_path / "inner.py")!r}])
        sys.exit(code)
    ''')
    proc = launch("outer.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = state(proc.stdout, "inner")
    assert (seen["backend"], seen["source"]) == ("cpu", "launcher")


def test_programs_own_init_backend_refines_the_launchers_activation(tmp_path):
    program = write(tmp_path, "prog.py", """
        import flagos_torchfl as ft
        first = ft.current_backend()
        again = ft.init_backend("cuda", memory_virtual_limit="1GiB", memory_pool_clear_interval=5)
        print(first.backend, again.backend, again.source, again.memory_limit_bytes(),
              again.settings.memory_pool_clear_interval)
        try:
            ft.init_backend("cuda", memory_virtual_limit="2GiB")
        except ft.AlreadyInitializedError as exc:
            print("second change refused:", "ft.deactivate()" in str(exc))
    """)
    proc = launch("--backend", "cpu", str(program), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"cpu cpu launcher {1 << 30} 5"
    assert lines[1] == "second change refused: True"
