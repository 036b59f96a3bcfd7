"""`RowQueue`: the HF engine's request queue. A request of `n` samples is `n` rows; each engine
step runs one batch of waiting rows that share their sampling settings (the decode path samples a
batch with one setting; seeds aside: every row draws from a generator of its own), the settings
with the smallest token budget first, so that short requests are not held behind long ones;
rows that arrive meanwhile wait for the next batch. A request is finished once all its rows are."""

from __future__ import annotations

import torch

from strategies.base import Completion, Request


def settings_key(request: Request) -> tuple:
    """What rows of one batch must share: every sampling setting but the seed and `n`."""
    s = request.sampling
    return (s.max_tokens, s.temperature, s.top_p, s.top_k, tuple(s.stop_token_ids))


def row_generator(seed: int | None, sample_index: int) -> torch.Generator | None:
    """Sample `sample_index`'s generator (on the CPU: every platform has one): seed + index, as
    vLLM seeds a request's samples; None without a seed (the process's generator)."""
    return None if seed is None else torch.Generator().manual_seed(seed + sample_index)


class RowQueue:
    """Rows (request, sample index) waiting, and the samples of requests partly done."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Request, int]] = []
        self.samples: dict[str, list[Completion]] = {}

    def add(self, requests: list[Request]) -> None:
        for request in requests:
            self.samples[request.request_id] = []
            self.waiting += [(request, k) for k in range(request.sampling.n)]

    def next_batch(self, max_rows: int) -> list[tuple[Request, int]]:
        """Up to `max_rows` waiting rows of one sampling setting (the smallest budget's), in the
        order they came; taken off the queue."""
        if not self.waiting:
            return []
        key = min((settings_key(r) for r, _ in self.waiting), key=lambda k: k[0])
        batch = [row for row in self.waiting if settings_key(row[0]) == key][:max_rows]
        taken = {(r.request_id, k) for r, k in batch}
        self.waiting = [(r, k) for r, k in self.waiting if (r.request_id, k) not in taken]
        return batch

    def record(
        self,
        batch: list[tuple[Request, int]],
        results: list[tuple[list[int], list[float], str]],
        routes: list[torch.Tensor | None],
    ) -> list[tuple[str, list[Completion]]]:
        """`batch`'s results (and each row's routed experts, None where not recorded) kept; the
        requests finished with them, their samples in order."""
        finished = []
        for (request, k), result, route in zip(batch, results, routes):
            samples = self.samples[request.request_id]
            samples.append(Completion(0, k, *result, routed_experts=route))
            if len(samples) == request.sampling.n:
                finished.append((request.request_id, sorted(samples, key=lambda c: c.sample_index)))
                del self.samples[request.request_id]
        return finished
