"""A toy rollout engine, the worked example of docs/extending.md: a whole engine in one module
(its strategy class and its config section), served through one registration and one
`configs/rollout/toy.yaml`. It decodes with a transformers model one token at a time, without a
KV cache: slow, but real, and enough for the pipeline to learn with it."""

from __future__ import annotations

import torch
from pydantic import StrictBool
from transformers import AutoModelForCausalLM

from strategies.base import Completion, InferenceStrategy, NamedTensors, SamplingConfig
from strategies.inference.settings import RolloutSettings


class ToySettings(RolloutSettings):
    """The toy engine's `rollout` section: the keys every engine reads, and one of its own."""

    greedy_only: StrictBool


class ToyEngine(InferenceStrategy):
    """Greedy or sampled decoding (temperature only) of a transformers model on the platform's device."""

    settings_cls = ToySettings
    model: torch.nn.Module | None = None

    def initialize(self, model_path: str, settings: ToySettings, sync_path: str | None = None) -> None:
        self.settings = settings
        model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
        self.model = model.to(self.platform.device()).eval()

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[Completion]:
        generator = torch.Generator().manual_seed(sampling.seed or 0)
        return [
            self._complete(p, s, prompt, sampling, generator)
            for p, prompt in enumerate(prompt_token_ids)
            for s in range(sampling.n)
        ]

    def _complete(self, p: int, s: int, prompt: list[int], sampling: SamplingConfig, generator) -> Completion:
        tokens, logprobs, reason = list(prompt), [], "length"
        budget = min(sampling.max_tokens, self.settings.max_model_len - len(prompt))
        for _ in range(budget):
            ids = torch.tensor([tokens], device=self.platform.device())
            logits = self.model(input_ids=ids).logits[0, -1].float().cpu()
            if sampling.temperature == 0 or self.settings.greedy_only:
                token = int(logits.argmax())
            else:
                token = int(
                    torch.multinomial((logits / sampling.temperature).softmax(-1), 1, generator=generator)
                )
            tokens.append(token)
            logprobs.append(float(logits.log_softmax(-1)[token]))
            if token in sampling.stop_token_ids:
                reason = "stop"
                break
        return Completion(p, s, tokens[len(prompt) :], logprobs, reason)

    def update_weights(self, named_tensors: NamedTensors) -> None:
        state = self.model.state_dict()
        for name, tensor in named_tensors:
            state[name].copy_(tensor)

    def read_weights(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().cpu() for name, tensor in self.model.state_dict().items()}

    def offload(self) -> None:
        self.model.to("cpu")

    def reload(self) -> None:
        self.model.to(self.platform.device())

    def shutdown(self) -> None:
        self.model = None
