"""Import one name the way a program does (``import X`` or ``from X import Y``) and print one
JSON line saying whether it worked and, if not, the exception.

Usage: import_probe.py MODULE [ATTRIBUTE]"""
import importlib
import json
import sys


def main(module, attribute=None):
    try:
        imported = importlib.import_module(module)
        if attribute:
            getattr(imported, attribute)
        result = {"ok": True}
    except Exception as exc:  # the probe reports any failure to import
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600]}
    print(json.dumps({"tag": "import", "module": module, "attribute": attribute, **result}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
