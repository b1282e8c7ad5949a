"""The sim's runtime: what a chip's driver and runtime library give PyTorch, without operators.

Its devices' process-wide state (:mod:`.state`: count, current device, lazy initialisation, the
random generators), the caching allocator (:mod:`.allocator`), storages and tensors on that memory
(:mod:`.tensors`), the ``torch.sim`` device module (:mod:`.device`) with its streams
(:mod:`.streams`) and graphs (:mod:`.graphs`: capture and replay), the dtypes the devices hold (:mod:`.capability`), and the C++ runtime built at
first use (:mod:`.cpp`: device guard, hooks, allocators, the C++ route of the native operators).
"""
