"""An Ultralytics user's program: train YOLOv8n (built from its yaml: random weights) on two GPUs,
``device=[0, 1]``, on a tiny synthetic dataset. Ultralytics starts its own DDP job (a generated
file run through ``python -m torch.distributed.run --nproc_per_node 2``) with
``find_unused_parameters=True`` and validates under ``torch.inference_mode()``.

    python yolo_ddp.py WORK_DIR

Everything it needs is written into WORK_DIR: 8 images of 64x64 pixels with coloured rectangles
and their YOLO labels, a data.yaml, Ultralytics' settings folder. No network: ``YOLO_OFFLINE``,
no hub or logger integrations, empty font files (``plots=False`` never opens them), and this
process refuses any connection that is not to the loopback interface.

Prints ``{"tag": "yolo_ddp", ...}``: the per-epoch losses and metrics of Ultralytics' results.csv
and the sum of the final weights' magnitudes.
"""
import csv
import json
import os
import socket
import sys
from pathlib import Path

WORK = Path(sys.argv[1])
SETTINGS = WORK / "ultralytics_settings"
SETTINGS.mkdir(parents=True, exist_ok=True)
os.environ.update(YOLO_OFFLINE="True", YOLO_CONFIG_DIR=str(SETTINGS), MPLCONFIGDIR=str(WORK / "mpl"))
for font in ("Arial.ttf", "Arial.Unicode.ttf"):  # check_font() finds these and downloads nothing
    (SETTINGS / font).write_bytes(b"")

_connect = socket.socket.connect


def _loopback_only(sock, address):
    host = address[0] if isinstance(address, tuple) else str(address)
    if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
        raise OSError(f"yolo_ddp: network access refused: {address}")
    return _connect(sock, address)


socket.socket.connect = _loopback_only

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402


def dataset(root: Path, images: int = 8, size: int = 64) -> Path:
    rng = np.random.default_rng(0)
    pictures, labels = root / "images" / "train", root / "labels" / "train"
    pictures.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    colours = [(220, 40, 40), (40, 60, 220)]
    for i in range(images):
        image = np.full((size, size, 3), 200, np.uint8) + rng.integers(0, 20, (size, size, 3), dtype=np.uint8)
        boxes = []
        for k in range(2):
            cls = (i + k) % 2
            w, h = rng.integers(12, 28, 2)
            x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
            image[y0:y0 + h, x0:x0 + w] = colours[cls]
            boxes.append(f"{cls} {(x0 + w / 2) / size:.6f} {(y0 + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}")
        Image.fromarray(image).save(pictures / f"im{i}.png")
        (labels / f"im{i}.txt").write_text("\n".join(boxes) + "\n")
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames:\n  0: red\n  1: blue\n")
    return data


def main() -> int:
    from ultralytics import YOLO, settings

    settings.update({"sync": False, "runs_dir": str(WORK / "runs"), "datasets_dir": str(WORK),
                     "weights_dir": str(WORK / "weights"), "clearml": False, "comet": False,
                     "dvc": False, "mlflow": False, "raytune": False, "tensorboard": False,
                     "wandb": False})
    data = dataset(WORK / "data")
    YOLO("yolov8n.yaml").train(
        data=str(data), epochs=2, imgsz=64, batch=4, device=[0, 1], workers=0, amp=False,
        plots=False, val=True, seed=0, deterministic=True, project=str(WORK / "runs"),
        name="train", exist_ok=True, pretrained=False, cache=False)
    run = WORK / "runs" / "train"
    with open(run / "results.csv") as f:
        epochs = [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    checkpoint = torch.load(run / "weights" / "last.pt", map_location="cpu", weights_only=False)
    model = checkpoint.get("ema") or checkpoint["model"]
    weights = sum(float(p.detach().double().abs().sum()) for p in model.state_dict().values()
                  if p.is_floating_point())
    print(json.dumps({"tag": "yolo_ddp", "epochs": epochs, "weights_abs_sum": weights,
                      "device_count": torch.cuda.device_count()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
