// Remove build outputs (portable rm -rf; no extra dependency).
const fs = require('fs');
const path = require('path');
for (const p of process.argv.slice(2)) {
  fs.rmSync(path.resolve(__dirname, '..', p), { recursive: true, force: true });
}
