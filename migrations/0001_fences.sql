-- Fences, fenced objects and the rejection log. Everything lives in schema "fencepost" so the
-- proxy can share a database with the application it protects.
CREATE SCHEMA IF NOT EXISTS fencepost;

-- One row per fence key: the highest token ever accepted. Rows are never deleted: deleting one
-- would let a stale token in again.
CREATE TABLE fencepost.fences (
  fence_key     text        PRIMARY KEY,
  highest_token bigint      NOT NULL CHECK (highest_token >= 0),
  accepted      bigint      NOT NULL DEFAULT 0,
  rejected      bigint      NOT NULL DEFAULT 0,
  created_at    timestamptz NOT NULL DEFAULT now(),
  updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE fencepost.objects (
  key          text        PRIMARY KEY,
  fence_key    text        NOT NULL,
  token        bigint      NOT NULL,
  version      bigint      NOT NULL,
  content_type text        NOT NULL,
  body         bytea       NOT NULL,
  updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE fencepost.rejections (
  id            bigserial   PRIMARY KEY,
  fence_key     text        NOT NULL,
  object_key    text,
  operation     text        NOT NULL,
  token         bigint      NOT NULL,
  highest_token bigint      NOT NULL,
  writer_id     text,
  rejected_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rejections_fence_key_id ON fencepost.rejections (fence_key, id DESC);
