"""What a notebook prints of a source file: definitions found by name, whole and as written."""

import textwrap

import pytest

from servelab import paths
from servelab.lab.source_excerpts import definition, excerpt

SOURCE = textwrap.dedent(
    '''
    import functools


    class Request:
        """A request."""

        image: str

        def size(self) -> int:
            return len(self.image)


    def create_app():
        limit = 3

        @functools.cache
        @staticmethod
        async def predict(request: Request) -> str:
            # comments inside are kept
            return request.image[:limit]

        return predict


    def version():
        return 1


    def version():  # defined again: this one is kept
        return 2
    '''
)


def test_a_definition_is_found_by_its_dotted_name_whole_with_its_decorators_and_dedented():
    assert definition(SOURCE, "create_app.predict") == textwrap.dedent(
        """\
        @functools.cache
        @staticmethod
        async def predict(request: Request) -> str:
            # comments inside are kept
            return request.image[:limit]"""
    )
    assert definition(SOURCE, "Request.size") == "def size(self) -> int:\n    return len(self.image)"
    assert definition(SOURCE, "Request").startswith('class Request:\n    """A request."""\n\n    image: str\n')
    assert definition(SOURCE, "version") == "def version():  # defined again: this one is kept\n    return 2"


def test_a_name_the_file_does_not_define_says_what_it_does_define():
    with pytest.raises(LookupError, match=r"create_ap: the module defines no 'create_ap'; it defines \['Request', "):
        definition(SOURCE, "create_ap")
    with pytest.raises(LookupError, match=r"Request.predict: Request defines no 'predict'; it defines \['size'\]"):
        definition(SOURCE, "Request.predict")


def test_notebook_3_s_excerpt_of_the_service_is_its_predict_route_and_schemas_as_on_disk():
    path = paths.SERVICE_PACKAGE_DIR / "predict_api.py"
    shown = excerpt(path, "PredictRequest", "create_app.predict")
    request, route = shown.split("\n\n# ")
    assert request.startswith("# servelab/service/predict_api.py: PredictRequest\nclass PredictRequest(BaseModel):")
    assert route.startswith('servelab/service/predict_api.py: create_app.predict\n@app.post(\n    "/predict",')
    assert "\nasync def predict(request: PredictRequest" in route
    # Whole and as written: every line of the excerpt is a line of the file, indentation aside.
    lines = {line.strip() for line in path.read_text().splitlines()}
    assert all(line.strip() in lines for line in shown.splitlines() if not line.startswith("# servelab/"))
