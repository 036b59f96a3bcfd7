"""The responses a person reads beside the curves (`tracking.generations` = N): the first N
responses of each step and of each evaluation, with the prompt, the reference answer and the reward,
appended to `<run dir>/generations.jsonl`, a line each (`step`, `eval`, `prompt`, `response`,
`answer`, `reward`), as verl's `rollout_data_dir` keeps its rollouts.

The first N are in the step's order: a prompt's samples together, so a group's rewards are read side
by side. A response is the text the reward was given (special tokens left out). A multi-turn
trajectory's prompt is its first prompt as the environment rendered it, and its response the rest
of its row, the environment's turns included.

The step's record carries them to the run's writer under `GENERATIONS` (metrics.jsonl and the
trackers' metrics get the rest); the trackers that keep tables get them as a table, `generations`
or `eval_generations`. The file is kept to the steps the run holds, as metrics.jsonl is."""

from __future__ import annotations

from pathlib import Path

from roll_device.pipeline.jsonlines import JsonLines

GENERATIONS = "generations"  # the record's key that carries a step's shown responses


def shown(step, samples, completions, rewards: list[float], count: int) -> list[dict]:
    """The first `count` `completions` (each of `samples[prompt_index]`) as lines of the file, their
    text as the step (`GrpoStep`, or its multi-turn kind) reads it (`texts`)."""
    chosen = completions[:count]
    prompts, responses = step.texts(samples, chosen)
    return [
        {"prompt": prompt, "response": response, "answer": samples[c.prompt_index].answer, "reward": reward}
        for c, prompt, response, reward in zip(chosen, prompts, responses, rewards)
    ]


class GenerationsLog(JsonLines):
    def __init__(self, run_dir: Path) -> None:
        super().__init__(Path(run_dir) / "generations.jsonl")

    def take(self, record: dict, evaluation: bool) -> list[dict]:
        """Write the generations `record` carries (taken out of it) under its step; the lines."""
        lines = [{"step": record["step"], "eval": evaluation, **line} for line in record.pop(GENERATIONS, ())]
        if lines:
            self.append(*lines)
        return lines
