"""The sim's integration with torch: claiming PyTorch's PrivateUse1 slot and registering the
runtime and kernels there (:mod:`.registration`), the answers torch's Python entry points need from
a backend written in Python (:mod:`.torch_patches`), ``torch.compile`` (:mod:`.inductor`),
``torch.distributed`` (:mod:`.collectives`), and the count of native calls the routing census reads
(:mod:`.native_calls`).
"""
