"""The compile step: a model as a user holds it (an ONNX path, bytes, a ModelProto, a `ds.from_torch` graph) made
into the typed build (`runtime.model_build.ModelBuild`) that runtime compiles, saves, loads and runs.

Why a layer of its own, above runtime: reading ONNX and exporting graphs are the frontends' work, and runtime
must not depend on them (pyproject.toml's contracts), while `ds.save` / `ds.load` need both.
"""
