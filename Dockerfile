# AgentProxy: the same install path as the README (pip install .), with the versions CI tested
# (constraints.txt) and the extras an operator expects: otel (tracing:), speed (uvloop); the
# Redis client (store: {backend: redis}) is a core dependency. Runs as a non-root user.
#   docker build -t agentproxy .
#   docker run -p 4000:4000 -e AGENTPROXY_KEY=sk-choose-one -e OPENAI_API_KEY \
#     -v "$PWD/examples/docker:/etc/agentproxy:ro" agentproxy
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY proxy ./proxy
RUN python -m venv /opt/agentproxy && /opt/agentproxy/bin/pip install --no-cache-dir -c constraints.txt '.[otel,speed]'

FROM python:3.11-slim
COPY --from=build /opt/agentproxy /opt/agentproxy
COPY policies/local.yaml /etc/agentproxy/agentproxy.yaml
RUN useradd --system --uid 10001 --home-dir /var/lib/agentproxy --create-home agentproxy
USER agentproxy
WORKDIR /var/lib/agentproxy
ENV PATH=/opt/agentproxy/bin:$PATH PYTHONUNBUFFERED=1
EXPOSE 4000
# /healthz on whichever port the proxy (PID 1) listens on: --port, server.port or 4000.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD python -m proxy.runtime.healthcheck
ENTRYPOINT ["agentproxy"]
# The port is server.port (4000 by default). Listening beyond loopback: configure
# keys.api_keys, or only loopback clients are served.
CMD ["serve", "--config", "/etc/agentproxy", "--host", "0.0.0.0"]
