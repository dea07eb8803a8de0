"""bench/soak.py's arithmetic and naming: a growth figure is a slope per 1,000
iterations, and an actor keeps one name while Ray retitles it per method."""

from __future__ import annotations

import os

from bench.soak import descendants, label_of, slope_per_1000


def test_growth_is_the_least_squares_slope_per_1000_iterations():
    assert slope_per_1000([(i, 10.0 + 0.05 * i) for i in range(100, 1001, 10)]) == 50.0
    assert abs(slope_per_1000([(i, 42.0) for i in range(100, 1001, 10)])) < 1e-9
    assert slope_per_1000([(100, 1.0), (100, 2.0), (100, 3.0)]) is None  # no spread in iterations


def test_an_actor_keeps_its_role_name_whichever_method_runs():
    assert label_of(7, 1, "ray::PolicyRole.train_batch") == label_of(7, 1, "ray::PolicyRole") == "ray::PolicyRole"
    assert label_of(1, 1, "python -m flows.ppo") == "driver"
    assert label_of(8, 1, "python -m uvicorn --factory processes.temporary_server:create_app") == "prefect api"
    assert label_of(9, 1, "/x/ray/core/src/ray/gcs/gcs_server --flag") == "ray gcs_server"
    rss, cpu = descendants(os.getpid())["driver"]
    assert rss > 10 and cpu > 0
