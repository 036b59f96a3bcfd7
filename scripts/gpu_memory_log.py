"""The GPU's used memory (every process on it, as the driver counts it) every INTERVAL seconds, one
CSV row `epoch_s,used_mib` per reading (added to OUT.csv), until killed. Read through NVML
(nvidia-ml-py), which makes no CUDA context of its own, so the readings do not count this process.
Wall-clock epoch seconds, so that benchmarks/gpu_job.py can join the readings with the spans of
each step's timeline.

python scripts/gpu_memory_log.py OUT.csv [INTERVAL] [GPU_INDEX]
"""

from __future__ import annotations

import sys
import time


def main(path: str, interval: float = 0.1, index: int = 0) -> None:
    try:
        import pynvml
    except ImportError:
        sys.exit("gpu_memory_log: nvidia-ml-py (pynvml) is not importable: no memory readings")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    with open(path, "a", buffering=1) as out:  # a later run into the same folder adds its readings
        if out.tell() == 0:
            out.write("epoch_s,used_mib\n")
        while True:
            used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
            out.write(f"{time.time():.3f},{used / 2**20:.0f}\n")
            time.sleep(interval)


if __name__ == "__main__":
    main(sys.argv[1], *(float(a) for a in sys.argv[2:3]), *(int(a) for a in sys.argv[3:4]))
