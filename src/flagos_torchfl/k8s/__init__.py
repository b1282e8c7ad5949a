"""Kubernetes: node labels in Node Feature Discovery's local-source format, and the manifests
that run a program on a chip pool (an Indexed Job with a headless Service, a Kubeflow Trainer
``TrainJob`` or a training-operator ``PyTorchJob``). Everything that differs by chip comes from
its :class:`~flagos_torchfl.backends.base.Backend` (``kubernetes``: :class:`~flagos_torchfl.backends.base.KubernetesDevices`)."""
