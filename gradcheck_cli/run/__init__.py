"""The run: plan, tasks, workers, the whole batch, shrinking, --lf, discovery, watch's worker."""
