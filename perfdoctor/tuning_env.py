"""Which environment variables matter for training performance, and how to show them safely.

Used by the analysis (captured environment in the trace) and by the capture manifest; pure Python
so that the capture side can import it inside a training job.
"""

from __future__ import annotations

TUNING_PREFIXES = ("NCCL_", "NVTE_", "CUDA_", "TORCH_", "PYTORCH_", "NVIDIA_TF32", "UB_", "MEGATRON_", "NEMO_")
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASS", "CREDENTIAL", "AUTH")  # PASS: PASSWD, PASSWORD, PASSPHRASE
REDACTED = "<redacted>"


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def tuning_env(env: dict[str, str]) -> dict[str, str]:
    """The tuning-relevant subset of ``env``, sorted, with secret-looking values redacted."""
    return {name: (REDACTED if is_secret(name) else value)
            for name, value in sorted(env.items()) if name.startswith(TUNING_PREFIXES)}
