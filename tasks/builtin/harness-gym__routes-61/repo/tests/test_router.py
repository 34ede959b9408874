import pytest

from routes import NotFound, Router


@pytest.fixture
def router():
    router = Router()
    router.add("/users/<int:user_id>", lambda user_id: f"user {user_id}")
    router.add("/files/<path:name>", lambda name: f"file {name}")
    return router


def test_root():
    router = Router()
    router.add("/", lambda: "home")
    assert router.dispatch("/") == "home"


def test_int_parameter(router):
    assert router.dispatch("/users/7") == "user 7"


def test_path_parameter_spans_slashes(router):
    assert router.dispatch("/files/docs/a/b.txt") == "file docs/a/b.txt"


def test_unknown_path(router):
    with pytest.raises(NotFound):
        router.dispatch("/nope")


def test_decorator_registers_route():
    router = Router()

    @router.route("/ping")
    def ping():
        return "pong"

    assert router.dispatch("/ping") == "pong"
