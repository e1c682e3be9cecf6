"""A vLLM plugin with which a server that raysweep starts loads the compiled graph it finds in the campaign's
shared cache on vLLM's CPU build, instead of compiling it again.

vLLM loads a cached graph in `vllm/compilation/decorators.py` (0.32: `_try_load_aot_compiled_fn`): torch
deserialises the saved function (`torch.compiler.load_compiled_function`), then vLLM calls
`finalize_loading` on what torch loaded. Only the functions of vLLM's own backend have that method
(`VllmSerializableFunction`, `vllm/compilation/caching.py`). The CPU build compiles with torch's Inductor
backend instead (`vllm/platforms/cpu.py`: `CompilationMode.DYNAMO_TRACE_ONCE`, backend `inductor`), whose saved
function torch loads as a `BundledAOTAutogradSerializableCallable` (`torch/_dynamo/aot_compile_types.py`); that
class hands unknown attributes to the plain function inside it, so vLLM logs `Compiling model again due to a
load failure ... 'function' object has no attribute 'finalize_loading'` and compiles again. Torch has loaded
that function whole by then (its Inductor kernels included), so there is nothing left to finalise: the plugin
gives the class a `finalize_loading` that does nothing, and vLLM then logs `Directly load AOT compilation`.

vLLM calls `register` in each of its processes (entry point `vllm.general_plugins` in pyproject.toml). It acts
only on servers that raysweep started with shared caches (`RAYSWEEP_AOT_LOAD=1`, `raysweep.serve.caches.node_dirs`)
and only when the class lacks the method (a torch or vLLM that has it, or a GPU start, whose functions are
vLLM's own, is left as it is). It imports nothing that vLLM has not imported already.
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["ENV", "register"]

log = logging.getLogger(__name__)

ENV = "RAYSWEEP_AOT_LOAD"


def _nothing_to_finalize(self: Any, vllm_config: Any) -> None:
    """Torch's Inductor function is complete once deserialised."""


def register() -> None:
    """vLLM's plugin hook: give torch's loaded Inductor function the `finalize_loading` that vLLM calls."""
    if os.environ.get(ENV) != "1":
        return
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as loaded
    except ImportError:  # a torch without AOT compilation: vLLM does not load compiled functions this way
        return
    if not hasattr(loaded, "finalize_loading"):
        setattr(loaded, "finalize_loading", _nothing_to_finalize)  # noqa: B010 - a class from another package
        log.debug("raysweep: torch's loaded Inductor functions take vLLM's finalize_loading")
