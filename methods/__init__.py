"""The drafting methods, one module (or folder) each; they import only the core. Installed as the import package
`specbench_methods` (pyproject.toml maps this folder onto that name).

Which name on the command line is which class, and what else each method has (a training recipe, a
calibrator, profiles), is the registry's: specbench_cli/registry.py.
"""
