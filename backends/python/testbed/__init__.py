"""gradcert's test bed: what the suite uses to test gradcert, kept apart from what a user
installs (the `gradcert` package beside it; pyproject.toml packages `gradcert` only).

    trainer     the PyTorch adapters' trainer (torch_ddp.py, torch_fsdp1.py, torch_fsdp2.py
                and the stack shims' optimizer): loss sum, D*S/N rule, optimizer, the loop
    mutants     the adapters' planted bugs (`--mutant ID`) and their candidate objectives
    checkpoint  the adapters' DCP save / load legs, with the planted resume bugs
    bugs.json   the one bug-class catalog (mutants reads it; so does CTest's BugCatalog.*)

Not installed: the adapters run as scripts from backends/python/ (their folder is on
sys.path), the stack shims add it (stacks/common.py), the tests through pytest.ini
(`pythonpath = .`) and tests/helpers.py.
"""
