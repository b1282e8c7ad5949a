"""``k8s``: Kubernetes clusters whose nodes hold different chips.

    python -m flagos_torchfl k8s labels [--write DIR [--interval SECONDS]] [--prefix P]
    python -m flagos_torchfl k8s daemonset --image IMAGE [--namespace NS] [--interval SECONDS]
    python -m flagos_torchfl k8s job --backend NAME|auto --nodes N --nproc-per-node M --image IMAGE
                                     [--kind job|trainjob|pytorchjob] [--name NAME] [--namespace NS]
                                     [--resource NAME] [--nodes-json FILE] -- SCRIPT ARGS...

``labels`` prints this node's labels in Node Feature Discovery's local-source format, from the
probe ``detect`` runs; ``--write`` writes the file NFD reads (atomically), ``--interval`` again
every SECONDS, each pass in a child process (no device runtime stays open in between).
``daemonset`` prints a DaemonSet that does so on every node. ``job`` prints the manifests that
run ``SCRIPT ARGS`` under torchrun on a chip pool (see :mod:`flagos_torchfl.k8s.manifests`);
``--backend auto --nodes-json FILE`` picks the pool from ``kubectl get nodes -o json`` and says
why on stderr. YAML goes to stdout.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

from ..version import __version__
from ..backends import registry
from ..errors import ConfigError
from ..k8s import emit, labels, manifests, pools


def add_parser(sub) -> None:
    p = sub.add_parser("k8s", help="Kubernetes: node labels, the labelling DaemonSet, a job for a chip pool")
    commands = p.add_subparsers(dest="k8s_command", metavar="K8S_COMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    lab = commands.add_parser("labels", help="this node's labels in NFD's local-source format")
    lab.add_argument("--write", metavar="DIR", help=f"write them to DIR/{labels.FILE_NAME} (NFD reads "
                                                    f"{labels.FEATURES_DIR})")
    lab.add_argument("--interval", type=int, metavar="SECONDS", help="with --write: again every SECONDS")
    _prefix(lab)
    lab.set_defaults(func=run_labels)

    ds = commands.add_parser("daemonset", help="a DaemonSet that writes the labels on every node")
    ds.add_argument("--image", required=True, help="an image with this package and the chips' plugins")
    ds.add_argument("--namespace", help="the namespace (default: kubectl's)")
    ds.add_argument("--interval", type=int, default=600, metavar="SECONDS",
                    help="seconds between two probes of a node (default 600)")
    _prefix(ds)
    ds.set_defaults(func=run_daemonset)

    job = commands.add_parser("job", help="the manifests that run a program on a chip pool")
    job.add_argument("--backend", required=True, help="the chip (a backend name), or `auto` with --nodes-json")
    job.add_argument("--nodes", type=int, required=True, help="nodes (pods), each running torchrun")
    job.add_argument("--nproc-per-node", type=int, required=True, help="processes (devices) per node")
    job.add_argument("--image", required=True, help="the container image")
    job.add_argument("--kind", default="job", help="job (Indexed Job + headless Service, default), "
                                                   "trainjob (Kubeflow Trainer) or pytorchjob (training operator)")
    job.add_argument("--name", help="the job's name (default torchfl-BACKEND)")
    job.add_argument("--namespace", help="the namespace (default: kubectl's)")
    job.add_argument("--resource", help="the device-plugin resource to request (default: the chip's usual one)")
    job.add_argument("--nodes-json", metavar="FILE", help="`kubectl get nodes -o json` output: check (or, "
                                                          "with --backend auto, pick) the chip pool")
    _prefix(job)
    job.add_argument("program", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS...")
    job.set_defaults(func=run_job)


def _prefix(parser) -> None:
    parser.add_argument("--prefix", default=labels.PREFIX, help=f"the label prefix (default {labels.PREFIX})")


def node_labels() -> dict:
    """This node's labels, for the backend automatic selection picks here (``detect``'s probe)."""
    import torch

    from .detect import collect

    data = collect()
    picked = data["auto_select"]["backend"]
    row = next(r for r in data["backends"] if r["name"] == picked)
    return labels.node_labels(row, torch.__version__, __version__)


def run_labels(args) -> int:
    labels.check_prefix(args.prefix)
    if args.interval is not None:
        if args.write is None or args.interval < 1:
            raise ConfigError("--interval needs --write DIR and a number of seconds, 1 or more")
        return _every(args)
    text = labels.render(node_labels(), args.prefix)
    if args.write is None:
        sys.stdout.write(text)
        return 0
    try:
        path = labels.write(text, args.write)
    except OSError as exc:
        print(f"flagos-torchfl k8s labels: cannot write {args.write}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _every(args) -> int:
    """Write the labels every ``args.interval`` seconds, each pass a child process; a failed pass
    is reported and the next one still runs."""
    command = [sys.executable, "-m", "flagos_torchfl", "k8s", "labels", "--write", args.write,
               "--prefix", args.prefix]
    while True:
        code = subprocess.call(command)
        if code:
            print(f"flagos-torchfl k8s labels: a pass ended with exit code {code}", file=sys.stderr)
        sys.stdout.flush()
        time.sleep(args.interval)


def run_daemonset(args) -> int:
    manifest = manifests.daemonset(args.image, registry().backends(), args.namespace, args.prefix,
                                   args.interval)
    sys.stdout.write(emit.dump_all([manifest]))
    return 0


def run_job(args) -> int:
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    labels.check_prefix(args.prefix)
    reg = registry()
    if args.backend.strip().lower() == "auto":
        if not args.nodes_json:
            raise ConfigError("--backend auto needs --nodes-json FILE (`kubectl get nodes -o json`) "
                              "to pick a chip pool from")
        candidates = [b for b in reg.backends() if b.auto_selectable]
    else:
        candidates = [reg.get(args.backend)]
    backend, resource = candidates[0], args.resource
    if args.resource:
        manifests.check_resource(args.resource)
    if args.nodes_json:
        # the options are checked before the node list is read: a bad one is named as such
        manifests.job_request(args.kind, backend, args.nodes, args.nproc_per_node, args.image, program,
                              args.name, args.namespace, args.resource, args.prefix)
        found, why = pools.choose(pools.read_nodes(args.nodes_json), candidates, args.nodes,
                                  args.nproc_per_node, args.prefix, args.nodes_json, args.resource)
        backend, resource = found.backend, found.resource
        print(f"flagos-torchfl k8s job: {why}", file=sys.stderr)
    request = manifests.job_request(args.kind, backend, args.nodes, args.nproc_per_node, args.image,
                                    program, args.name, args.namespace, resource, args.prefix)
    sys.stdout.write(emit.dump_all(manifests.build(request)))
    return 0
