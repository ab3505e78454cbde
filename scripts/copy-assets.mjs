// Part of `npm run build`: the files dist/ needs beside the compiled JavaScript.
import { cpSync } from 'node:fs';
cpSync('src/proxy/http/dashboard', 'dist/proxy/http/dashboard', { recursive: true });
