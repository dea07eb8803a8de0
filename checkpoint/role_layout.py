"""The file names of a role's save inside a boundary. Kept apart from the code that
writes them (role_state.py, sharded_role.py, which import torch) so that reading a
boundary's marker and files, as the command line's resume check does before anything
starts, imports no torch."""

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
TRAINER_STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.pt"
# Written by retention (S-CKPT-6) beside a role whose OPTIMIZER_FILE it removed; a resume refuses it.
OPTIMIZER_PRUNED_NOTE = "OPTIMIZER_PRUNED"

# A sharded role (torch.distributed.checkpoint): one directory each for model and optimizer.
SHARDED_MODEL_DIR = "model"
SHARDED_OPTIMIZER_DIR = "optimizer"
PARAM_GROUPS_FILE = "optimizer_param_groups.json"

# The base model a boundary was trained from (S-SEC-4): the per-file record in the
# boundary, and under this key in the marker's loop_state the digest alone.
BASE_MODEL_FILE = "base_model.json"
BASE_MODEL_KEY = "base_model"

# The learned reward model a boundary's rewards came from (S-RM-2), recorded like the base model.
REWARD_MODEL_FILE = "reward_model.json"
REWARD_MODEL_KEY = "reward_model"
# The reward role's save inside a boundary: the running normalisation of the model's scores.
REWARD_DIR = "reward"
