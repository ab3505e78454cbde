# The fencepost image: the proxy (`serve`, the default), `elect`, `migrate` and the demo writers.
FROM node:20-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund
COPY bin ./bin
COPY src ./src
COPY migrations ./migrations
COPY types ./types
COPY tsconfig.json ./
USER node
ENV HOST=0.0.0.0 PORT=8080
EXPOSE 8080
ENTRYPOINT ["node", "bin/fencepost.js"]
CMD ["serve"]
