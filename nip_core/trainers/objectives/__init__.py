"""Loss modules of the TensorDict RL trainers and their maths (GAE set-up, Nyström IHVP)."""
