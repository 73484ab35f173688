# shellcheck shell=bash
# The Debian 12 packages of the C++ libraries zerowait's build needs, in one list: setup.sh
# installs them with apt-get, gpu-prepare.sh carries them to a GPU machine that has no registry.
# Sourced, not run.
BUILD_LIBRARY_PACKAGES=(
  liburing-dev libzstd-dev libxxhash-dev libturbojpeg0-dev libjpeg-dev libpng-dev libwebp-dev
  libsndfile1-dev zlib1g-dev nlohmann-json3-dev libcli11-dev libgtest-dev libcurl4-openssl-dev
  libssl-dev libexpat1-dev
)
