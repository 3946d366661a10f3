"""What lives around the pipeline in an agent's loop: guards, spill, health, checkpoints,
continuation checks, overflow recovery. Each module is small and exposed through ``Session``."""
