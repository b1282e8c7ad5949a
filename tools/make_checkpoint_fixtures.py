"""Write the checkpoint fixtures of tests/test_checkpoint.py: a small state dict whose storages are
tagged as a CUDA machine and an Ascend machine tag them (``cuda:0`` and ``npu:0``), written on
this CPU machine by a temporary location tagger. The ``npu:0`` one also carries the device record
``flagos_torchfl.save`` adds (as written on an Ascend machine with this package), in the earlier
layout: an entry ``<archive>/.data/flagos_torchfl.json`` (``ft.save`` now writes it as the
archive's comment; ``ft.checkpoint_info`` reads both).

    python tools/make_checkpoint_fixtures.py [OUT_DIR]   (default: tests/fixtures/checkpoints)
"""
import io
import json
import sys
import zipfile
from pathlib import Path

import torch
import torch.serialization as serialization

from flagos_torchfl import checkpoint


def state():
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4
    return {"weight": weight, "weight_t": weight.t(), "bias": torch.tensor([0.5, -1.0]),
            "steps": torch.tensor(7, dtype=torch.int64), "epoch": 3}


def write_tagged(tag: str) -> bytes:
    def tagger(storage):
        return tag if storage.device.type == "cpu" else None

    serialization.register_package(-100, tagger, lambda storage, location: None)
    try:
        buffer = io.BytesIO()
        torch.save(state(), buffer)
        return buffer.getvalue()
    finally:
        serialization._package_registry[:] = [e for e in serialization._package_registry if e[1] is not tagger]


def with_record_entry(archive: bytes, record: dict) -> bytes:
    """``archive`` (what ``torch.save`` wrote) with ``record`` added as an entry, the earlier layout of the record."""
    buffer = io.BytesIO(archive)
    with zipfile.ZipFile(buffer, "a") as zf:
        prefix = zf.namelist()[0].split("/")[0]
        zf.writestr(f"{prefix}/.data/{checkpoint.RECORD}", json.dumps(record, sort_keys=True))
    return buffer.getvalue()


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda0.pt").write_bytes(write_tagged("cuda:0"))
    record = {"format": checkpoint.FORMAT, "backend": "ascend", "device_type": "npu",
              "devices": ["npu:0"], "torch": "2.6.0", "flagos_torchfl": "0.1.0"}
    (out / "npu0.pt").write_bytes(with_record_entry(write_tagged("npu:0"), record))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests/fixtures/checkpoints")
