"""What the API and the workers share: configuration, the database models and session, the queue.

Layering: api/ (HTTP) -> jobs/ (DB + queue) <- worker/ (tasks) -> eagle3/. The database is the single source of
truth for job and item state; the broker only carries "decode item N" messages.
"""
