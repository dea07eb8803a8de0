"""Role saves, export, retention and the marker rules, with role bodies in-process."""

from __future__ import annotations

import logging
import shutil

import pytest
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from checkpoint.boundary import boundary_path, update_latest, write_marker
from checkpoint.export import main as export_main
from checkpoint.retention import prune_optimizer_state
from checkpoint.role_files import RoleCheckpointError
from checkpoint.role_state import OPTIMIZER_PRUNED_NOTE
from configs.loading import load_config
from rundir.run_identity import RunIdentity, identity_problem
from placement.plan import TRAINER_ROLES
from roles.critic_role import CriticRole
from roles.data_role import DataRole
from roles.policy_role import PolicyRole
from tests.conftest import TINY_PROFILE, first_rank


@pytest.fixture(scope="module")
def committed(tiny_model_dir, tmp_path_factory):
    """Three committed boundaries written by real role bodies."""
    config = load_config(TINY_PROFILE, [f"model.path={tiny_model_dir}"])
    policy = PolicyRole(config, first_rank(config, "policy"))
    critic, data = CriticRole(config, first_rank(config, "critic")), DataRole(config)
    root = str(tmp_path_factory.mktemp("ckpt") / "checkpoints")
    for iteration in (1, 2, 3):
        boundary = boundary_path(root, iteration)
        policy.save(f"{boundary}/policy")
        critic.save(f"{boundary}/critic")
        data.save(f"{boundary}/data")
        write_marker(boundary, iteration=iteration, role_steps={"policy": 0, "critic": 0},
                     loop_state={"critic_warmup_iterations": 0})
        update_latest(root, iteration)
    return config, root


def test_export_writes_plain_hugging_face_folders_that_load_and_generate(committed, tmp_path):
    _, root = committed
    assert export_main([boundary_path(root, 3), str(tmp_path / "out")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "policy")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out" / "policy")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "7"}], add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] > ids.shape[1]
    critic = AutoModelForTokenClassification.from_pretrained(tmp_path / "out" / "critic")
    assert critic(ids).logits.shape == (1, ids.shape[1], 1)


def test_export_refuses_an_uncommitted_boundary(committed, tmp_path):
    _, root = committed
    partial = tmp_path / "iter_000009"
    shutil.copytree(boundary_path(root, 3), partial)
    (partial / "_SUCCESS").unlink()
    assert export_main([str(partial), str(tmp_path / "out")]) == 2


def test_retention_keeps_optimizer_state_of_the_newest_only_and_resume_from_older_is_refused(committed, tmp_path):
    config, root = committed
    copy = str(tmp_path / "checkpoints")
    shutil.copytree(root, copy)
    assert prune_optimizer_state(copy, 0) == []  # 0 keeps all (S-CKPT-6)
    pruned = prune_optimizer_state(copy, None)  # unset: newest only
    assert sorted(pruned) == sorted(f"{boundary_path(copy, i)}/{r}" for i in (1, 2) for r in TRAINER_ROLES)
    assert (tmp_path / "checkpoints" / "iter_000003" / "policy" / "optimizer.pt").exists()
    assert (tmp_path / "checkpoints" / "iter_000001" / "policy" / OPTIMIZER_PRUNED_NOTE).exists()
    with pytest.raises(RoleCheckpointError, match="removed by retention"):
        PolicyRole(config, first_rank(config, "policy")).load(f"{boundary_path(copy, 1)}/policy")
    PolicyRole(config, first_rank(config, "policy")).load(f"{boundary_path(copy, 3)}/policy")


def test_retention_after_going_back_neither_counts_nor_touches_the_abandoned_branch(committed, tmp_path):
    """Back at iter_000001 and committing iteration 2 anew: iter_000003 is the
    abandoned branch; it must not take the newest slot from the boundary just committed."""
    _, root = committed
    copy = str(tmp_path / "checkpoints")
    shutil.copytree(root, copy)
    pruned = prune_optimizer_state(copy, None, up_to=2)
    assert sorted(pruned) == sorted(f"{boundary_path(copy, 1)}/{r}" for r in ("policy", "critic"))
    assert (tmp_path / "checkpoints" / "iter_000002" / "policy" / "optimizer.pt").exists()
    assert (tmp_path / "checkpoints" / "iter_000003" / "policy" / "optimizer.pt").exists()


def test_marker_without_loop_state_is_unknown_not_a_mismatch(committed, caplog):
    config, _ = committed
    logger = logging.getLogger("ppo.resume")  # outside a flow run, resume logs here
    logger.addHandler(caplog.handler)
    try:
        identity_problem({"version": 1, "iteration": 2}, RunIdentity(config), "b/iter_000002")  # S-CW-10
    finally:
        logger.removeHandler(caplog.handler)
    assert "could not be verified" in caplog.text
    problem = identity_problem(
        {"iteration": 2, "loop_state": {"critic_warmup_iterations": 1}}, RunIdentity(config), "b/iter_000002"
    )
    assert "rl.critic_warmup_iterations=1 but this run is configured with 0" in problem


def test_restored_pristine_optimizer_stays_empty_and_keeps_its_learning_rate(committed):
    config, root = committed
    policy = PolicyRole(config.model_copy(deep=True), first_rank(config, "policy"))
    policy.runtime.optimizer.param_groups[0]["lr"] = 123.0
    state = policy.load(f"{boundary_path(root, 3)}/policy")
    assert state["optimizer_pristine"] is True  # S-CW-8
    assert len(policy.runtime.optimizer.state) == 0
    assert policy.runtime.optimizer.param_groups[0]["lr"] == config.rl.optimizer.policy_lr
