// The version has one source: ddp_magic/_version.py. Every build copies it into
// package.json (so the bundle in the wheel carries the Python package's version);
// `node scripts/sync-version.js --check` only reports a mismatch (exit 1).
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const pyFile = path.join(root, '..', 'ddp_magic', '_version.py');
const pkgFile = path.join(root, 'package.json');

const match = /__version__\s*=\s*["']([^"']+)["']/.exec(fs.readFileSync(pyFile, 'utf8'));
if (!match) {
  console.error(`sync-version: no __version__ in ${pyFile}`);
  process.exit(1);
}
// PEP 440 pre-releases (0.2.0a1, 0.2.0rc1, 0.2.0.dev3) become semver (0.2.0-alpha.1, ...).
function toSemver(v) {
  const m = /^(\d+\.\d+\.\d+)(?:\.?(a|b|rc|dev)(\d+))?$/.exec(v);
  if (!m) {
    throw new Error(`sync-version: cannot map Python version ${v} to semver`);
  }
  if (!m[2]) {
    return m[1];
  }
  const tag = { a: 'alpha', b: 'beta', rc: 'rc', dev: 'dev' }[m[2]];
  return `${m[1]}-${tag}.${m[3]}`;
}
const want = toSemver(match[1]);
const check = process.argv.includes('--check');
let bad = false;

const text = fs.readFileSync(pkgFile, 'utf8');
const pkg = JSON.parse(text);
if (pkg.version !== want) {
  bad = true;
  if (check) {
    console.error(`sync-version: package.json has ${pkg.version}, ddp_magic/_version.py has ${match[1]} (${want})`);
  } else {
    fs.writeFileSync(pkgFile, text.replace(/("version"\s*:\s*")[^"]*(")/, `$1${want}$2`));
    console.log(`sync-version: package.json ${pkg.version} -> ${want}`);
  }
}

const tsFile = path.join(root, 'src', 'version.ts');
const ts = `// Written by scripts/sync-version.js from ddp_magic/_version.py; do not edit.\nexport const VERSION = '${want}';\n`;
const had = fs.existsSync(tsFile) ? fs.readFileSync(tsFile, 'utf8') : '';
if (had !== ts) {
  bad = true;
  if (check) {
    console.error(`sync-version: src/version.ts does not say ${want}`);
  } else {
    fs.writeFileSync(tsFile, ts);
    console.log(`sync-version: src/version.ts -> ${want}`);
  }
}
process.exit(check && bad ? 1 : 0);
