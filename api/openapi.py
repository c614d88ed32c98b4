"""GET /openapi.json: OpenAPI 3.1, its schemas generated from the pydantic models the views validate with."""
from __future__ import annotations

from functools import cache

from flask import Blueprint
from pydantic.json_schema import models_json_schema

from jobs import openai_spec

from . import openai_schemas as o
from . import schemas as s

bp = Blueprint("openapi", __name__)


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def body(name: str, media: str = "application/json") -> dict:
    return {"content": {media: {"schema": ref(name)}}}


def problems(*codes: int) -> dict:
    text = {400: "Malformed JSON or JSONL", 401: "Missing, invalid or revoked API key", 404: "No such job",
            429: "Rate limit or queued-items limit exceeded (see Retry-After)", 409: "Conflict", 413: "Too large",
            415: "Unsupported content type", 422: "Invalid field (see errors[].field)", 502: "The item failed",
            503: "A dependency is unavailable", 504: "Timed out; poll the job"}
    return {str(c): {"description": text[c], **body("Problem", "application/problem+json")}
            for c in (*codes, 401, 429)}


def query(name: str, schema: dict, description: str = "") -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
SCHEDULE_ID = {"name": "schedule_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
OPEN = {"security": []}  # no API key needed
HTML = {"description": "HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}
SCHEDULE = {"description": "The schedule", "content": {"application/json": {"schema": {"type": "object"}}}}


@cache
def spec() -> dict:
    models = [(m, "validation") for m in (s.JobCreate, s.JobOptions, s.GenerateRequest, s.ScheduleCreate,
                                          s.ScheduleUpdate)] + \
             [(m, "serialization") for m in (s.JobOut, s.JobList, s.ResultOut, s.ResultList, s.GenerateOut,
                                             s.Problem, s.HealthOut)] + \
             [(m, "validation") for m in (openai_spec.ChatCompletionRequest, openai_spec.CompletionRequest,
                                          openai_spec.BatchCreate)] + \
             [(m, "serialization") for m in (o.ChatCompletion, o.Completion, o.ModelList, o.Model, o.OpenAIError,
                                             o.FileObject, o.FileList, o.FileDeleted, o.Batch, o.BatchList)]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    upload = {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary", "description": "JSONL, one ItemIn object per line"},
        "job": {"type": "string", "description": "JSON of JobOptions (type, params, priority, metadata, labels, "
                                                 "policy)"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "EAGLE-3 batch inference jobs", "version": "1",
                 "description": "Bulk generation and content-review jobs decoded with EAGLE-3 speculative decoding."},
        "paths": {
            "/v1/jobs": {
                "post": {"summary": "Submit a bulk job", "operationId": "createJob",
                         "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                                         "schema": {"type": "string", "maxLength": 255},
                                         "description": "The same key returns the same job."}],
                         "requestBody": {"required": True, "content": {
                             "application/json": {"schema": ref("JobCreate")},
                             "multipart/form-data": {"schema": upload}}},
                         "responses": {"202": {"description": "Accepted", **body("JobOut")},
                                       **problems(400, 409, 413, 415, 422, 503)}},
                "get": {"summary": "List jobs, newest first", "operationId": "listJobs",
                        "parameters": [query("status", {"type": "string"}, "comma-separated statuses"),
                                       query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                                       query("after", {"type": "string"}, "next_cursor of the previous page")],
                        "responses": {"200": {"description": "A page of jobs", **body("JobList")},
                                      **problems(422, 503)}},
            },
            "/v1/jobs/{job_id}": {"get": {
                "summary": "Job status, counts, timestamps and speedup stats", "operationId": "getJob",
                "parameters": [JOB_ID], "responses": {"200": {"description": "The job", **body("JobOut")},
                                                      **problems(404, 503)}}},
            "/v1/jobs/{job_id}/results": {"get": {
                "summary": "Finished items in input order (paginated JSON, or JSONL stream)",
                "operationId": "getResults",
                "parameters": [JOB_ID, query("format", {"enum": ["json", "jsonl"]}),
                               query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
                               query("after", {"type": "integer"}, "next_cursor of the previous page")],
                "responses": {"200": {"description": "Results", "content": {
                    "application/json": {"schema": ref("ResultList")},
                    "application/x-ndjson": {"schema": ref("ResultOut")}}}, **problems(404, 422, 503)}}},
            "/v1/jobs/{job_id}/cancel": {"post": {
                "summary": "Cancel: queued items do not run, running ones finish", "operationId": "cancelJob",
                "parameters": [JOB_ID], "responses": {"200": {"description": "The job", **body("JobOut")},
                                                      **problems(404, 409, 503)}}},
            "/generate": {"post": {
                "summary": "Generate for one prompt synchronously (through the queue, top priority)",
                "operationId": "generate", "requestBody": {"required": True, **body("GenerateRequest")},
                "responses": {"200": {"description": "Text and stats", **body("GenerateOut")},
                              **problems(400, 415, 422, 502, 503, 504)}}},
            "/v1/schedules": {
                "post": {"summary": "Create a scheduled job (cron, timezone, job template, item source)",
                         "operationId": "createSchedule",
                         "requestBody": {"required": True, **body("ScheduleCreate")},
                         "responses": {"201": SCHEDULE, **problems(400, 413, 415, 422, 503)}},
                "get": {"summary": "List the key's schedules", "operationId": "listSchedules",
                        "responses": {"200": {"description": "Schedules", "content": {
                            "application/json": {"schema": {"type": "object"}}}}, **problems(503)}},
            },
            "/v1/schedules/{schedule_id}": {
                "get": {"summary": "A schedule and its recent runs", "operationId": "getSchedule",
                        "parameters": [SCHEDULE_ID], "responses": {"200": SCHEDULE, **problems(404, 503)}},
                "patch": {"summary": "Change a schedule", "operationId": "updateSchedule",
                          "parameters": [SCHEDULE_ID], "requestBody": {"required": True, **body("ScheduleUpdate")},
                          "responses": {"200": SCHEDULE, **problems(400, 404, 415, 422, 503)}},
                "delete": {"summary": "Delete a schedule (its jobs stay)", "operationId": "deleteSchedule",
                           "parameters": [SCHEDULE_ID],
                           "responses": {"204": {"description": "Deleted"}, **problems(404, 503)}},
            },
            "/health": {"get": {
                "summary": "Database, broker and a worker on the batch queue", "operationId": "health", **OPEN,
                "responses": {"200": {"description": "All up", **body("HealthOut")}, **problems(503)}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "operationId": "metrics", **OPEN,
                                 "responses": {"200": {"description": "Prometheus text format",
                                                       "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/": {"get": {"summary": "Status page (HTML): the key's recent jobs; a login form without the cookie",
                          "operationId": "statusPage", **OPEN,
                          "parameters": [query("key", {"type": "string"}, "an API key: sets the cookie, redirects")],
                          "responses": {"200": HTML, "303": {"description": "Signed in: to /"},
                                        "400": HTML, "401": HTML}}},
            "/login": {"post": {"summary": "Status page sign-in: sets an HttpOnly cookie with the key",
                                "operationId": "login", **OPEN, "requestBody": {"required": True, "content": {
                                    "application/x-www-form-urlencoded": {"schema": {
                                        "type": "object", "properties": {"key": {"type": "string"}}}}}},
                                "responses": {"200": HTML, "303": {"description": "Signed in: to /"}, "400": HTML,
                                              "401": HTML}}},
            "/logout": {"post": {"summary": "Status page sign-out", "operationId": "logout", **OPEN,
                                 "responses": {"303": {"description": "Signed out: to /"}}}},
            "/openapi.json": {"get": {"summary": "This document", "operationId": "openapi", **OPEN,
                                      "responses": {"200": {"description": "OpenAPI 3.1"}}}},
            **openai_paths(),
        },
        "security": [{"bearer": []}],
        "components": {"schemas": top["$defs"], "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "An API key (e3k_...) from `python -m api.keys create --name NAME`."}}},
    }


def openai_errors(*codes: int) -> dict:
    text = {400: "Invalid request (param names the field)", 401: "Missing, invalid or revoked API key",
            404: "Not found (or another key's)", 409: "Conflict", 413: "Too large", 415: "Unsupported content type",
            502: "The request failed in the worker", 503: "A dependency is unavailable",
            504: "Timed out (the job continues)"}
    return {str(c): {"description": text.get(c, "Too many requests"), **body("OpenAIError")}
            for c in (*codes, 401, 429)}


def openai_paths() -> dict:
    """The OpenAI-compatible routes (errors in OpenAI's shape; see api/openai_api.py)."""
    stream = {"text/event-stream": {"schema": {"type": "string", "description": (
        "data: <chunk JSON> lines as the worker decodes (their text concatenates to the non-streamed answer), "
        "then the finish chunk (with `eagle3`), the usage chunk with stream_options.include_usage, and "
        "data: [DONE]; an error after the stream began is a data: {\"error\": ...} line")}}}

    def sync(summary, op, request, response):
        return {"post": {"summary": summary, "operationId": op, "requestBody": {"required": True, **body(request)},
                         "responses": {"200": {"description": "The completion (or its SSE stream with stream=true)",
                                               "content": {"application/json": {"schema": ref(response)},
                                                           **stream}},
                                       **openai_errors(400, 404, 415, 502, 503, 504)}}}

    return {
        "/v1/chat/completions": sync("OpenAI chat completion (one item through the queue, top priority)",
                                     "createChatCompletion", "ChatCompletionRequest", "ChatCompletion"),
        "/v1/completions": sync("OpenAI completion (the prompt is one user turn, chat template applied)",
                                "createCompletion", "CompletionRequest", "Completion"),
        "/v1/models": {"get": {"summary": "The served model", "operationId": "listModels",
                               "responses": {"200": {"description": "Models", **body("ModelList")},
                                             **openai_errors()}}},
        "/v1/models/{model}": {"get": {
            "summary": "One model", "operationId": "getModel",
            "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "The model", **body("Model")}, **openai_errors(404)}}},
        **files_paths(), **batches_paths(),
    }


def path_id(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def files_paths() -> dict:
    upload = {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary", "description": "JSONL: {custom_id, method, url, body} lines"},
        "purpose": {"enum": ["batch"]}}}
    page = [query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}),
            query("after", {"type": "string"}, "a file id: the page after it"),
            query("purpose", {"type": "string"}), query("order", {"enum": ["asc", "desc"]})]
    content = {"description": "The file's bytes", "content": {"application/octet-stream": {
        "schema": {"type": "string", "format": "binary"}}}}
    return {
        "/v1/files": {
            "post": {"summary": "Upload a batch input file (multipart, purpose=batch)", "operationId": "createFile",
                     "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": upload}}},
                     "responses": {"200": {"description": "The file", **body("FileObject")},
                                   **openai_errors(400, 413)}},
            "get": {"summary": "The key's files (inputs and batch outputs)", "operationId": "listFiles",
                    "parameters": page, "responses": {"200": {"description": "Files", **body("FileList")},
                                                      **openai_errors(400)}}},
        "/v1/files/{file_id}": {
            "get": {"summary": "A file", "operationId": "getFile", "parameters": [path_id("file_id")],
                    "responses": {"200": {"description": "The file", **body("FileObject")}, **openai_errors(404)}},
            "delete": {"summary": "Delete a file", "operationId": "deleteFile", "parameters": [path_id("file_id")],
                       "responses": {"200": {"description": "Deleted", **body("FileDeleted")},
                                     **openai_errors(404)}}},
        "/v1/files/{file_id}/content": {"get": {
            "summary": "A file's content (output and error files: OpenAI's batch output lines, with an `eagle3` "
                       "stats field in each response body)", "operationId": "getFileContent",
            "parameters": [path_id("file_id")], "responses": {"200": content, **openai_errors(404)}}},
    }


def batches_paths() -> dict:
    batch = {"200": {"description": "The batch", **body("Batch")}}
    return {
        "/v1/batches": {
            "post": {"summary": "Create a batch from an input file; it runs as a job", "operationId": "createBatch",
                     "requestBody": {"required": True, **body("BatchCreate")},
                     "responses": {**batch, **openai_errors(400, 415)}},
            "get": {"summary": "The key's batches, newest first", "operationId": "listBatches",
                    "parameters": [query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                                   query("after", {"type": "string"}, "a batch id: the page after it")],
                    "responses": {"200": {"description": "Batches", **body("BatchList")}, **openai_errors(400)}}},
        "/v1/batches/{batch_id}": {"get": {
            "summary": "A batch: status, request_counts, usage, timestamps, errors, output/error file ids",
            "operationId": "getBatch", "parameters": [path_id("batch_id")],
            "responses": {**batch, **openai_errors(404)}}},
        "/v1/batches/{batch_id}/cancel": {"post": {
            "summary": "Cancel: queued requests do not run; finished ones stay in the output file",
            "operationId": "cancelBatch", "parameters": [path_id("batch_id")],
            "responses": {**batch, **openai_errors(404, 409)}}},
    }


@bp.get("/openapi.json")
def openapi():
    return spec()
