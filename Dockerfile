# The image the Kubernetes manifests run (deploy/k8s): the processor and the mirror sidecar.
# Build:  docker build -t REGISTRY/argus:0.1.0 .   (then push it where your nodes pull from)
# Neither needs PyTorch or a GPU: the training pods bring their own torch and run `argus run`
# from their own environment (pip install argus-trace there).
FROM python:3.11-slim

WORKDIR /opt/argus
COPY pyproject.toml README.md ./
COPY argus ./argus
# s3: the mirror sidecar (argus sync --watch); py-spy (a dependency) reads the training
# processes' stacks through hostPID + SYS_PTRACE
RUN pip install --no-cache-dir '.[s3]' && argus --version

ENTRYPOINT []
CMD ["argus", "--help"]
