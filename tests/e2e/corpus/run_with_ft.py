"""Runs a corpus script the three-line way: ``import flagos_torchfl as ft``,
``ft.auto_select_backend()``, then the unchanged script (as ``__main__``, with its own argv)."""
import runpy
import sys

import flagos_torchfl as ft

ft.auto_select_backend()
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
