"""What the tests share: tiny configs and models, traced fixtures, hostile-file tools, model zoos.

Imported as ``helpers.<module>`` (``pyproject.toml`` puts ``tests/`` on the path), never by bare
module name; one copy of each helper, used by every test that needs it.
"""
