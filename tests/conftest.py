pytest_plugins = ["conftest_comfy"]
