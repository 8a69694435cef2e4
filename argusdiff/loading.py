"""One process-wide lock around every torch model construction.

diffusers' and transformers' ``from_pretrained`` build models under accelerate's
``init_empty_weights``, which patches ``torch.nn.Module.register_parameter`` for the *whole
process* while it runs. A module another thread constructs meanwhile gets its parameters on the
meta device and then silently ignores the weights loaded into it (torch warns "copying from a
non-meta parameter in the checkpoint to a meta parameter ... is a no-op"). In the service, worker
threads load pipelines while another thread builds the discriminator or the prompt encoder, so
every place that constructs a model (pipelines, demo models, the level classifier, the
discriminator, the CLIP scorers, the prompt encoder) does it under :data:`MODEL_BUILD_LOCK`.

Re-entrant, so a loader may call another loader. Inference never takes it.
"""

from __future__ import annotations

import threading

__all__ = ["MODEL_BUILD_LOCK"]

MODEL_BUILD_LOCK = threading.RLock()
