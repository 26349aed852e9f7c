"""What the Ray tests share."""

# two optimizer steps per training step (two mini-batches) so the old log-probs are computed too,
# and a KL loss so the reference log-probs are: every worker computation is on the path
COMMON = (
    "trainer.resume=disable",
    "actor.use_kl_loss=true",
    "actor.ppo_mini_batch_size=2",
    "ray.num_cpus_per_worker=1",
    "ray.num_threads=1",
)
