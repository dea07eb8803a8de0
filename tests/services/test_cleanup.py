"""`python -m cli.cleanup RUN_NAME` removes the leftover role actors of that run only
(issue 8: "a command removes leftovers of a named run")."""

from __future__ import annotations

import pytest

from placement.plan import TRAINER_ROLES


class _Leftover:
    def ready(self) -> bool:
        return True


def test_cleanup_kills_the_named_runs_actors_and_leaves_other_runs_alone(ray_cluster, capsys):
    import ray

    from cli.cleanup import main

    def start(role: str, run: str):
        handle = (
            ray.remote(_Leftover).options(name=role, namespace=f"ppo-{run}", num_cpus=0, lifetime="detached").remote()
        )
        ray.get(handle.ready.remote())
        return handle

    start("policy", "leftover-probe")
    start("critic", "leftover-probe")
    other = start("policy", "other-probe")
    try:
        assert main(["leftover-probe"]) == 0
        assert "killed actors critic, policy" in capsys.readouterr().out
        for role in TRAINER_ROLES:
            with pytest.raises(ValueError):
                ray.get_actor(role, namespace="ppo-leftover-probe")
        assert ray.get(ray.get_actor("policy", namespace="ppo-other-probe").ready.remote())

        assert main(["leftover-probe"]) == 0
        assert "no actors left in namespace ppo-leftover-probe" in capsys.readouterr().out
    finally:
        ray.kill(other)
