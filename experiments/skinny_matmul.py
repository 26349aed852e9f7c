"""CPU time of a wide float32 matrix times a few rows, in F.linear's orientation ``h W^T`` and as ``(W h^T)^T``.

    python experiments/skinny_matmul.py

One thread; the shapes of a decode step of the 0.5B bench model (Qwen2-0.5B: fused gate/up 9,728 x 896,
one of them 4,864 x 896, a 2,048-row matrix, the 151,936 x 896 head), Gemma 3 270M's and SmolLM2's fused
gate/up (4,096 x 640, 3,072 x 576), SmolLM2's head (49,152 x 576) and the tiny model's gate/up (384 x 64),
times 1-64 rows; the two orientations alternate, the median of the repeats is printed in milliseconds.
What :data:`queryrl.rollout.fast_decode.WIDE_RATIO`, ``WIDE_MIN_ELEMENTS`` and ``SKINNY_ROWS`` were chosen from.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(9728, 896), (4864, 896), (2048, 896), (151936, 896), (4096, 640), (3072, 576), (49152, 576), (384, 64)]
ROWS = (1, 4, 8, 16, 32, 64)


def main() -> None:
    torch.set_num_threads(1)
    for out, inn in SHAPES:
        weight = torch.randn(out, inn)
        cells = []
        for m in ROWS:
            h = torch.randn(m, inn)
            linear: list[float] = []
            flipped: list[float] = []
            F.linear(h, weight), torch.mm(weight, h.t())  # first calls out of the timing
            for _ in range(3 if out > 100_000 else 15 if out * inn > 100_000 else 200):
                start = time.process_time()
                F.linear(h, weight)
                linear.append(time.process_time() - start)
                start = time.process_time()
                torch.mm(weight, h.t()).t().contiguous()
                flipped.append(time.process_time() - start)
            cells.append(f"{m} rows {statistics.median(linear) * 1e3:.1f} / {statistics.median(flipped) * 1e3:.1f}")
        print(f"{out} x {inn}, h W^T / (W h^T)^T ms: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
