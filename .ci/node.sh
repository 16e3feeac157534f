# Sourced by .ci/run and .ci/test-node: which Node lines CI tests, and where each binary comes from.
#
# The machine's own Node serves its own major. Any other major runs on the official binary
# that the Node project publishes on the npm registry (node-<platform>-<arch>, the same files
# as nodejs.org's tarballs), pinned to an exact version here and installed with npm into a
# cache folder outside the repository, so that nothing is downloaded from anywhere but the
# npm registry and a second run installs nothing.

# The Node lines CI tests, oldest first. Keep in step with `engines` in package.json.
CI_NODE_MAJORS=(20 22 24 26)

# The exact version of each line when it is not the machine's Node. Bump these by hand.
declare -A CI_NODE_PINNED=([20]=20.20.2 [22]=22.23.5 [24]=24.22.3 [26]=26.12.1)

# The install-path tests (`npm pack` into the consumer projects, the README's install from git)
# take minutes and test npm, the packed files and the build more than a Node line: CI runs them
# on one line, the oldest `engines` promises, where a consumer's module resolution would break
# first.
CI_INSTALL_TESTS_MAJOR=${CI_NODE_MAJORS[0]}
CI_INSTALL_TESTS='__tests__/external/'

# Prints the arguments `npm test` passes to jest on the given major, one a line: none on
# CI_INSTALL_TESTS_MAJOR, the install-path tests left out on every other line.
ci_jest_args() {
  if [[ "$1" != "$CI_INSTALL_TESTS_MAJOR" ]]; then printf '%s\n' --testPathIgnorePatterns "$CI_INSTALL_TESTS"; fi
}

CI_NODE_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/express-dp-router"

# Prints the directory that holds the `node` binary of the given major, installing it first
# when needed. Progress goes to stderr, so that `dir=$(ci_node_bin 24)` captures the path only.
ci_node_bin() {
  local major=$1
  local machine
  machine=$(node -p 'process.versions.node.split(".")[0]')
  if [[ "$major" == "$machine" ]]; then
    dirname "$(command -v node)"
    return
  fi
  local version=${CI_NODE_PINNED[$major]:-}
  if [[ -z "$version" ]]; then
    echo "no pinned Node version for major '$major' (known: ${!CI_NODE_PINNED[*]}); add one to .ci/node.sh" >&2
    return 1
  fi
  local package prefix bin
  package=$(node -p '`node-${process.platform}-${process.arch}`')
  prefix="$CI_NODE_CACHE/node-$major"
  bin="$prefix/node_modules/$package/bin"
  if [[ "$("$bin/node" --version 2>/dev/null)" != "v$version" ]]; then
    echo "installing Node $version ($package@$version from the npm registry) into $prefix" >&2
    mkdir -p "$prefix"
    # --no-save/--no-package-lock: the cache folder holds the binary only, no manifest to drift.
    npm install --prefix "$prefix" --no-save --no-package-lock --ignore-scripts \
      --no-audit --no-fund --loglevel=error "$package@$version" >&2
    if [[ "$("$bin/node" --version)" != "v$version" ]]; then
      echo "$bin/node is not Node $version" >&2
      return 1
    fi
  fi
  echo "$bin"
}
