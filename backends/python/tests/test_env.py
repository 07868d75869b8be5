"""The protocol's environment variables are one list on each side: gradcert/_env.py holds the
same strings as conformance/protocol/variables.hpp, and no Python source of the package or the
test bed spells one out by hand."""

import glob
import os
import re
import unittest

from helpers import REPO

from gradcert import _env

NAME = re.compile(r'"(GRADCERT_[A-Z_]+)"')


class ProtocolVariables(unittest.TestCase):
    def test_python_list_equals_the_cpp_table(self):
        with open(os.path.join(REPO, "conformance", "protocol", "variables.hpp")) as f:
            cpp = set(NAME.findall(f.read()))
        self.assertEqual(set(_env.PROTOCOL), cpp)

    def test_no_hand_written_name_outside_the_list(self):
        sources = glob.glob(os.path.join(REPO, "backends", "python", "gradcert", "**", "*.py"), recursive=True)
        sources += glob.glob(os.path.join(REPO, "backends", "python", "testbed", "*.py"))
        found = {}
        for path in sources:
            if os.path.basename(path) == "_env.py":
                continue
            with open(path) as f:
                names = NAME.findall(f.read())
            if names:
                found[os.path.relpath(path, REPO)] = names
        self.assertEqual(found, {}, "use gradcert._env's names")


if __name__ == "__main__":
    unittest.main()
