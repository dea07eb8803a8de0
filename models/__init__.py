"""Model loading shared by every role (one code path for the tiny model and a hub
model) and the builders of the tiny CPU models, including their brief pre-training."""
