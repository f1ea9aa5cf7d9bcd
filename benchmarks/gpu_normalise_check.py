"""The loader's uint8 pixels normalised on the GPU against the CPU for every byte value and three usual means and
stds (``vitscope.models.preprocess.normalise_pixels``); prints one JSON line. Run on a machine with CUDA."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch

from vitscope.models.preprocess import normalise_pixels

every = torch.arange(256, dtype=torch.uint8).repeat(3, 1).view(1, 3, 16, 16)
out = {}
for mean, std in [((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                  ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))]:
    spec = type("Spec", (), {"mean": mean, "std": std})()
    gpu, cpu = normalise_pixels(every.cuda(), spec).cpu(), normalise_pixels(every, spec)
    m, sd = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    by_number = ((every.cuda().float() / 255.0 - m.cuda()) / sd.cuda()).cpu()  # the divisor as a number
    out[str(mean)] = {"equal": bool(torch.equal(gpu, cpu)), "values_differing": int((gpu != cpu).sum()),
                      "number_divisor_values_differing": int((by_number != cpu).sum())}
print(json.dumps({"card": torch.cuda.get_device_name(0), "torch": torch.__version__, "checks": out}))
