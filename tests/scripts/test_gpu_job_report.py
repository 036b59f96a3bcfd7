"""benchmarks/gpu_job.py, the GPU job's report: the GPU's memory readings joined with each step's
phases, and the section it writes from a gpu-job.sh folder (the H100 runs kept in results/gpu_job/);
benchmarks/job_summary.py, the line gpu-job.sh prints per job."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_job import PHASES, load_results, phase_peaks, section
from benchmarks.job_summary import summary

RESULTS = Path(__file__).resolve().parents[2] / "results" / "gpu_job"


def test_each_phase_peaks_at_the_highest_reading_inside_its_spans_over_all_steps():
    records = [
        {"timeline": {"rollout": [10.0, 11.0], "update": [11.0, 12.0], "sync": [12.0, 12.05]}},
        {"timeline": {"rollout": [20.0, 21.0], "update": [21.0, 22.0]}},
    ]
    times = [9.5, 10.2, 10.9, 11.5, 12.5, 20.5, 21.5, 21.9, 30.0]
    used = [99.0, 5.0, 7.0, 9.0, 98.0, 6.0, 11.0, 3.0, 97.0]
    peaks = phase_peaks(records, times, used)
    assert peaks["rollout"] == 7.0 and peaks["update"] == 11.0
    assert peaks["sync"] is None, "no reading inside a span shorter than the interval"
    assert set(peaks) == set(PHASES) and peaks["for_rollout"] is None, "a phase the steps never had"


def test_the_section_has_a_row_per_job_and_the_turns_only_where_they_were_timed():
    results = [load_results(RESULTS / "2026-11-27a"), load_results(RESULTS / "2026-11-27b")]
    assert [job["name"] for r in results for job in r["jobs"]] == ["tiny", "megatron", "qwen2.5-0.5b-shaped"]
    text = section(results)
    (tiny,) = [line for line in text.splitlines() if line.startswith("| tiny | 30 | 0.211 -> 0.972 |")]
    assert "not timed" in tiny, "the tiny job ran before the turns were timed"
    shaped = results[1]["jobs"][0]
    assert shaped["turns_timed"] and shaped["means"]["swap_s"] > 0
    assert shaped["means"]["step_s"] >= shaped["means"]["swap_s"] + shaped["means"]["train_s"]
    assert "| 0.5b | fsdp -> hf | colocated |" in text, "the sync benchmark's GPU lines"


def test_job_summary_leaves_out_the_warm_up_step_and_a_cut_short_sync(tmp_path):
    parts = ("rollout_s", "reward_s", "logprob_s", "train_s", "sync_s", "swap_s", "step_s")
    synced = {"response_len": 8.0, "weights_version": 1}
    records = [
        {"step": 1, "reward_mean": 0.2, **synced, **dict.fromkeys(parts, 10.0)},
        {"step": 2, "reward_mean": 0.5, **synced, **dict.fromkeys(parts, 1.0)},
        {"step": 2, "eval_pass@1": 0.5},
        {"step": 3, "reward_mean": 0.9, **synced, **dict.fromkeys(parts, 1.0), "response_len": 4.0},
        {
            "step": 4,
            "reward_mean": 0.8,
            **dict.fromkeys(parts, 7.0),
            "response_len": 4.0,
            "weights_version": None,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert summary("tiny", str(tmp_path), samples_per_step=64) == (
        "job tiny: 4 steps, reward 0.200 -> 0.800; per step rollout=1.000s reward=1.000s logprob=1.000s "
        "train=1.000s sync=1.000s swap=1.000s step=1.000s; rollout 384 tokens/s"
    )
    assert summary("none", str(tmp_path / "missing")).startswith("job none: no step finished")
