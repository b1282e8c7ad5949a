"""The sim's operators: which ATen operators its devices run natively (:mod:`.native_ops`), the
kernels that run them on the device's memory (:mod:`.kernels`; the C++ route is in
:mod:`..runtime.cpp`), and sparse tensors' kernels (:mod:`.sparse`).
"""
