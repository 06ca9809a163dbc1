from tests.layers.conftest import driver, lbox  # noqa: F401 - the two layer drivers, shared
