"""Write the checkpoint fixtures of tests/distributed: a small state dict whose storages are
tagged as a CUDA machine and an Ascend machine tag them (``cuda:0`` and ``npu:0``), written on
this CPU machine by a temporary location tagger. The ``npu:0`` one also carries the device record
``flagos_torchfl.save`` adds (as written on an Ascend machine with this package).

    python tools/make_checkpoint_fixtures.py [OUT_DIR]   (default: tests/fixtures/checkpoints)
"""
import io
import sys
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


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda0.pt").write_bytes(write_tagged("cuda:0"))
    record = {"format": checkpoint.FORMAT, "backend": "ascend", "device_type": "npu",
              "devices": ["npu:0"], "torch": "2.6.0", "flagos_torchfl": "0.1.0"}
    (out / "npu0.pt").write_bytes(checkpoint.append_record(write_tagged("npu:0"), record))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests/fixtures/checkpoints")
