# AgentProxy: the same install path as the README (pip install .), run as a non-root user.
#   docker build -t agentproxy .
#   docker run -p 4000:4000 -v $PWD/policies:/etc/agentproxy:ro agentproxy
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN python -m venv /opt/agentproxy && /opt/agentproxy/bin/pip install --no-cache-dir .

FROM python:3.11-slim
COPY --from=build /opt/agentproxy /opt/agentproxy
COPY policies/local.yaml /etc/agentproxy/agentproxy.yaml
RUN useradd --system --uid 10001 --home-dir /var/lib/agentproxy --create-home agentproxy
USER agentproxy
WORKDIR /var/lib/agentproxy
ENV PATH=/opt/agentproxy/bin:$PATH PYTHONUNBUFFERED=1
EXPOSE 4000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:4000/healthz', timeout=2)"
ENTRYPOINT ["agentproxy"]
# Listening beyond loopback: configure keys.api_keys, or only loopback clients are served.
CMD ["serve", "--config", "/etc/agentproxy", "--host", "0.0.0.0", "--port", "4000"]
