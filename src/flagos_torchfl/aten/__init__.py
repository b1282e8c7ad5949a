"""What this package knows about ATen operators, below the backends and routing that use it:
the dispatcher's answers (:mod:`.dispatcher`), the semantic name table (:mod:`.names`) and
dtype sets (:mod:`.dtypes`)."""
