"""/openapi.json describes every route the app serves, with schemas from the validating pydantic models."""
import re

from api.schemas import JobCreate


def test_spec_covers_every_route(app, client):
    response = client.get("/openapi.json")
    assert response.status_code == 200
    spec = response.get_json()
    assert spec["openapi"].startswith("3.")
    served = {(re.sub(r"<(\w+)>", r"{\1}", rule.rule), method.lower())
              for rule in app.url_map.iter_rules() if rule.endpoint != "static"
              for method in rule.methods - {"HEAD", "OPTIONS"}}
    documented = {(path, method) for path, ops in spec["paths"].items() for method in ops}
    assert served == documented


def test_spec_schemas_are_the_validating_models(client):
    spec = client.get("/openapi.json").get_json()
    schemas = spec["components"]["schemas"]
    job_create = schemas["JobCreate"]
    assert set(job_create["properties"]) == set(JobCreate.model_fields)
    assert job_create["required"] == ["items"] and job_create["additionalProperties"] is False
    item = schemas["ItemIn"]["properties"]
    assert item["prompt"]["anyOf"][0]["minLength"] == 1 and item["messages"]["anyOf"][0]["minItems"] == 1
    assert item["parallel_degree"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 16}
    refs = set(references(spec))
    assert refs and refs <= {f"#/components/schemas/{name}" for name in schemas}  # no dangling reference


def references(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from references(value)
    elif isinstance(node, list):
        for value in node:
            yield from references(value)
