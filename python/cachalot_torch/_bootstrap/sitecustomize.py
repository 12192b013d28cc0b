"""Run at start-up by every Python process that a script launched with
`python -m cachalot_torch run` starts (the launcher puts this folder first
on PYTHONPATH; cachalot_torch/_children.py says why). When the launcher's
variable is set, a finder waits for the process's first `import torch`
and hands it to cachalot_torch._children, which installs cachalot once
torch has run; nothing else is imported before that. Then the
sitecustomize this one shadows (the next on sys.path) runs, as Python
would have run it."""


def _run():
    import os
    import sys
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    here = os.path.dirname(os.path.realpath(__file__))

    class TorchWatch:
        """Finds nothing but torch, and torch through _children's hook."""

        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path[:] = [f for f in sys.meta_path if f is not TorchWatch]
            try:
                import cachalot_torch._children as children
            except ImportError:
                # the package this folder belongs to, when no entry has it
                sys.path.append(os.path.dirname(os.path.dirname(here)))
                import cachalot_torch._children as children
            return children.hook_spec(name, path, target)

    raw = os.environ.get("CACHALOT_TORCH_CHILDREN")
    if raw:
        import json

        try:
            prefix = json.loads(raw).get("prefix")
        except (ValueError, AttributeError):
            prefix = None  # (a malformed value is reported at import torch)
        # another Python installation than the launcher's is left alone
        if not isinstance(prefix, str) or os.path.realpath(prefix) == os.path.realpath(sys.prefix):
            sys.meta_path.insert(0, TorchWatch)
    for entry in sys.path:
        if entry and os.path.realpath(entry) != here:
            spec = PathFinder.find_spec("sitecustomize", [entry])
            if spec is not None and spec.loader is not None:
                module = module_from_spec(spec)
                sys.modules["sitecustomize"] = module
                spec.loader.exec_module(module)
                return


_run()
del _run
