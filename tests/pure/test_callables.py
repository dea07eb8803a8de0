"""One resolver for `package.module:callable` config values (issue 15): every failure
names the config key and the value, whichever key it is."""

from __future__ import annotations

import pytest

from configs.callables import check_callable_module, import_callable

NOT_CALLABLE = 3


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("tests.pure.test_callables", "is not a 'package.module:callable' path"),
        ("no_such_package.mod:make", "no module named 'no_such_package' (looked in"),
        ("tests.pure.test_callables:nothing", "module 'tests.pure.test_callables' has no attribute 'nothing'"),
        ("tests.pure.test_callables:NOT_CALLABLE", "resolves to a int, not a callable"),
    ],
)
@pytest.mark.parametrize("key", ["rl.data.factory", "data_packer.factory", "rl.reward.terminal_callable"])
def test_every_failure_leads_with_the_key_and_the_value(key, path, fragment):
    with pytest.raises(ValueError) as raised:
        import_callable(path, key=key)
    assert str(raised.value).startswith(f"{key}: {path!r}")
    assert fragment in str(raised.value)


def test_the_caller_chooses_the_error_type():
    class MyConfigError(ValueError):
        pass

    with pytest.raises(MyConfigError, match=r"^k: 'nowhere_pkg:y': no module named 'nowhere_pkg' \(looked in "):
        check_callable_module("nowhere_pkg:y", key="k", error=MyConfigError)
    with pytest.raises(MyConfigError, match=r"^k: 'nowhere_pkg.x:y': no module named 'nowhere_pkg' \(looked in "):
        check_callable_module("nowhere_pkg.x:y", key="k", error=MyConfigError)
    assert check_callable_module("json:loads", key="k") == "json:loads"
    assert import_callable("json:JSONDecoder.decode", key="k").__name__ == "decode"
