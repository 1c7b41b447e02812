"""Training recipes of the shipped models: shared infrastructure (:mod:`.common`: checkpoints with
resume, work folders, mixed precision, stages) and one module per recipe (shapes, arena, text)."""
