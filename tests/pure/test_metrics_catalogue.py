"""The metrics catalogue is the one list of metrics.jsonl keys (issue 15): its doc is
generated from it, and it stays importable without torch, Ray or Prefect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from algorithm.metrics_catalogue import METRICS, WHEN, render

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_metrics_reference_doc_is_generated_from_the_catalogue():
    committed = (REPO_ROOT / "docs" / "reference" / "metrics.md").read_text()
    assert committed == render(), "run: python -m algorithm.metrics_catalogue > docs/reference/metrics.md"


def test_every_entry_is_complete_and_listed_once():
    keys = [metric.key for metric in METRICS]
    assert len(keys) == len(set(keys)), "a key is listed twice"
    for metric in METRICS:
        assert metric.meaning and metric.unit and (REPO_ROOT / metric.source).is_file(), metric
        assert metric.conditions and set(metric.conditions) <= set(WHEN), metric


def test_catalogue_imports_without_torch_ray_or_prefect():
    heavy = ("torch", "ray", "prefect")
    probe = f"import sys, algorithm.metrics_catalogue; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
